"""`nmt serve`: a translation server (nmt.serve.app), its batching (nmt.serve.batching) and its
web page (page.html)."""
