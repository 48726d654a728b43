"""Test doubles that are real programs: a stand-in HTTP server and fake systemctl/journalctl."""
