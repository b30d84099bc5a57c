"""The LLM policy: ProgRM Table 11's prompt, the action grammar an answer must parse to, and an
in-process or OpenAI-compatible chat client."""
