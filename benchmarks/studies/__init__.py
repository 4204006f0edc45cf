"""One-off studies whose results are now docs pages (README.md says which page each made)."""
