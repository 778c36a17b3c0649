"""Templates, rows of values, and the tokens and segments of a filled prompt."""
