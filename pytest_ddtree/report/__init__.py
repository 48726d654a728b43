"""What a session tells people: the text summary and results files, report.html, the history and its change points, the frontier.

Why a room of their own: every page is built from the same records; one room keeps their wording and
their escaping of hostile text in one place.
"""
