"""A Chainlit app that does nothing but answer: Chainlit's own floor, for ``bench-page``.

It does per message what the chat page must do at least (send an empty reply, stream one
token into it, update it), so the time to its first token is what Chainlit itself costs.
Started by ``bench-page`` with the project's ``.chainlit/config.toml`` (same socket settings).
"""

import chainlit as cl


@cl.on_chat_start
async def start() -> None:
    """Nothing to set up; Chainlit still marks the chat started, which clients wait for."""


@cl.on_message
async def echo(message: cl.Message) -> None:
    reply = cl.Message(content="", metadata={"in_reply_to": message.id})  # as the page marks its replies
    await reply.send()
    await reply.stream_token("echo")
    await reply.update()
