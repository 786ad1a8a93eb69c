"""Row and column codecs between PostgreSQL rows and pybatch values.

Every conversion between a stored row and a value happens in a codec, and decoding fails
closed: a row the codec cannot read completely is refused, never half-used. This package
imports nothing at load time, so values may use the stdlib-only primitives without pulling in
the driver or creating import cycles.
"""
