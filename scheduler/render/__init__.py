"""Rendering shared by the read side: plain-text tables (``table``) and SVG charts (``svg``).

Below ``projections`` and ``replay``, which both print and draw through it, so neither has
to import the other for a table or a chart. Imports nothing of ours but ``events.ledgertime``.
"""
