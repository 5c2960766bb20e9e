"""HTTP serving: OpenAI, Responses and Anthropic APIs, and the output parsers they share."""
