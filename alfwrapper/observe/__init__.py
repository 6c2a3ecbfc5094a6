"""Read-only questions: status and metrics, explain, check, doctor."""
