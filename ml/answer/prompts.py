"""The answer engine's prompt: one system prompt and one user template, for every mode and every backbone."""

SYSTEM_PROMPT = "You answer questions using only the notes. Reply with the answer in a few words."
USER_TEMPLATE = "Notes:\n{notes}\nQuestion: {question}"
