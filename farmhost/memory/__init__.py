"""BM25 search over each group's markdown memory and chat transcripts."""
