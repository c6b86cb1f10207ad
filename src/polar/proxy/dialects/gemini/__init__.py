"""The Gemini API (``generateContent``, ``streamGenerateContent``, ``countTokens``)."""
