"""The chat page's engine link: timeouts, history fitting, streaming, errors, rendering of ``chainlit.md``."""
