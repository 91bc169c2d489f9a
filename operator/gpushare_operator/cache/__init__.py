"""Slim informer records and the indexes over them; fed by events, read-only above."""
