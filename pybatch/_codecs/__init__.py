"""Row codecs: every row <-> value conversion; a row not read completely is refused."""
