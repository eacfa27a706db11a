"""A tool from outside the core: counts the words of a text (the model's own drafts, say)."""

from rlcore.api import Tool, ToolResult


def count_words(arguments):
    text = arguments.get("text")
    if not isinstance(text, str):
        return ToolResult('error: word_count takes {"text": "..."}', error=True)
    return ToolResult(str(len(text.split())))


WORD_COUNT = Tool(
    name="example/word_count",
    description="Count the words of a text.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    execute=count_words,
    timeout_s=2.0,
)
