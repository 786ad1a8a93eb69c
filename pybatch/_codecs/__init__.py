"""Row codecs: every row <-> value conversion; a row not read completely is refused, not half-used.

Imports nothing at load time, so values may use the stdlib-only primitives without import cycles.
"""
