"""Errors raised by the AMQP codec, each carrying the AMQP reply code to close with.

Theory of operation: the codec never closes anything itself; it raises an AMQPError whose
`reply_code` and `reply_text` the connection puts straight into connection.close (or
channel.close for soft errors). DecodeError means a payload could not be parsed (502
SYNTAX_ERROR, or 540 NOT_IMPLEMENTED for an unknown method); FrameError means the frame layer
itself is broken (501 FRAME_ERROR) and the connection cannot continue.
"""


class AMQPError(Exception):
    """An error with an AMQP reply code and text (spec 1.2, reply-code/reply-text)."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(reply_code, reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text

    def __str__(self) -> str:
        return f"{self.reply_code} {self.reply_text}"


class DecodeError(AMQPError):
    """A method, content header or field table payload could not be decoded."""


class FrameError(AMQPError):
    """The frame stream is corrupt (bad end marker, unknown type, oversize frame)."""
