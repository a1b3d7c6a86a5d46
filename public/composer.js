// Nothing typed into the chat box is lost while the page connects (Chainlit 2.12: its composer is
// the textarea #chat-input and the button #chat-submit).
//
// Chainlit's composer is disabled until the page's socket is connected: Enter does nothing and
// says nothing. And the first message the page shows (the demo model's banner, the engine's
// start-up progress) swaps the welcome screen's box for a fresh, empty one at the bottom. So a
// message typed and sent as soon as the page appeared was gone without a trace. Here, what is
// typed moves to the new box, and Enter on a disabled composer keeps the message, shows a notice,
// and sends it as soon as the composer is enabled (emptying the box gives the message up).
(() => {
  "use strict";
  const NOTICE = "Connecting to the chat… your message will be sent as soon as the page is connected.";
  const setValue = Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, "value").set;
  let draft = ""; // what was typed and not sent yet
  let held = false; // Enter was pressed on a disabled composer
  let lastBox = null;
  let notice = null;

  const box = () => document.getElementById("chat-input");
  const send = () => document.getElementById("chat-submit");

  function showNotice(shown) {
    if (shown && notice === null) {
      notice = document.createElement("div");
      notice.id = "erniechat-pending";
      notice.setAttribute("role", "status");
      notice.textContent = NOTICE;
      notice.style.cssText =
        "position:fixed;top:12px;left:50%;transform:translateX(-50%);z-index:1000;padding:8px 14px;" +
        "border-radius:8px;background:#fff4d6;color:#5c4400;border:1px solid #e6c463;font:14px sans-serif;";
      document.body.appendChild(notice);
    } else if (!shown && notice !== null) {
      notice.remove();
      notice = null;
    }
  }

  function check() {
    const b = box();
    if (b === null) return;
    if (b !== lastBox && b.value === "" && draft !== "") {
      setValue.call(b, draft); // a fresh box replaced the one typed in: the text moves with it
      b.dispatchEvent(new Event("input", { bubbles: true })); // and Chainlit's state follows
    }
    lastBox = b;
    if (!held) return;
    const button = send();
    if (b.value.trim() === "") {
      held = false; // emptied: given up
    } else if (button !== null && !button.disabled) {
      held = false;
      draft = "";
      button.click();
    }
    showNotice(held);
  }

  document.addEventListener(
    "input",
    (e) => {
      if (e.target.id === "chat-input") draft = e.target.value;
    },
    true,
  );
  document.addEventListener(
    "keydown",
    (e) => {
      if (e.key !== "Enter" || e.shiftKey || e.isComposing || e.target !== box()) return;
      const button = send(); // none while a reply is written (Stop instead): Chainlit keeps the text
      if (button !== null && !button.disabled) {
        draft = ""; // Chainlit sends it now
      } else if (button !== null && e.target.value.trim() !== "") {
        held = true;
        check();
      }
    },
    true,
  );
  document.addEventListener(
    "click",
    (e) => {
      if (e.target.closest?.("#chat-submit")) draft = "";
    },
    true,
  );
  setInterval(check, 100);
})();
