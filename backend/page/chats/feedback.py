"""Thumbs up and down on one's own replies only, answered for what they are.

Chainlit 2.12's ``PUT /feedback`` and ``DELETE /feedback`` answer 200 "success" whatever the data layer
does: feedback on another user's message was refused by the store's writer, silently, and deleting a
made-up id answered 200 too. These routes take their place (``chainlit_internals.own_feedback_routes``):
the message must be in one of the asker's chats (403 when it is another user's, 404 when there is no
such message), the feedback to delete must exist (404) and be on the asker's message (403); only then
is the write queued. ``on_feedback`` callbacks are not called (this page has none).
"""

from __future__ import annotations

from typing import Any

from chainlit.server import UserParam
from chainlit.types import DeleteFeedbackRequest, UpdateFeedbackRequest
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

from backend.page.chats.store import ChatStore

NO_MESSAGE = "There is no such message."
NOT_YOURS = "This message is in another user's chat."
NO_FEEDBACK = "There is no such feedback."


def feedback_routes(store: ChatStore) -> dict[str, Any]:
    """The two endpoints, by HTTP method, on ``store``."""

    async def put_feedback(request: Request, update: UpdateFeedbackRequest, current_user: UserParam) -> JSONResponse:
        """Feedback on a message of the asker's own chats; 403 / 404 otherwise, nothing written."""
        asker = _asker(current_user)
        await store.writer.due_done()  # a reply's last version, asked for a moment ago, is in the database
        owner = await store.message_owner(update.feedback.forId)
        _refuse_unless_theirs(owner, asker, NO_MESSAGE)
        if update.feedback.id:
            earlier = await store.feedback_message(update.feedback.id)
            if earlier is not None and earlier != update.feedback.forId:
                raise HTTPException(403, "This feedback is on another message.")
        feedback_id = await store.upsert_feedback(update.feedback)
        return JSONResponse(content={"success": True, "feedbackId": feedback_id})

    async def delete_feedback(
        request: Request, payload: DeleteFeedbackRequest, current_user: UserParam
    ) -> JSONResponse:
        """Removes the asker's own feedback; 404 for an unknown id, 403 for another user's."""
        await store.writer.due_done()
        message = await store.feedback_message(payload.feedbackId)
        if message is None:
            raise HTTPException(404, NO_FEEDBACK)
        _refuse_unless_theirs(await store.message_owner(message), _asker(current_user), NO_FEEDBACK)
        await store.delete_feedback(payload.feedbackId)
        return JSONResponse(content={"success": True})

    return {"PUT": put_feedback, "DELETE": delete_feedback}


def _asker(user: Any) -> str:
    if user is None:
        raise HTTPException(401, "Log in first.")
    return str(user.identifier)


def _refuse_unless_theirs(owner: str | None, asker: str, missing: str) -> None:
    if owner is None:
        raise HTTPException(404, missing)
    if owner != asker:
        raise HTTPException(403, NOT_YOURS)
