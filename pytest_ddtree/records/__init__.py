"""A session's records: their words, their shapes, the recorder that journals them, the hand-over of a folder.

Why a room of their own: a record crosses modules, processes and files (xdist workers, journals,
results.json); what a record is and how it survives a crash live together, apart from what writes it.
"""
