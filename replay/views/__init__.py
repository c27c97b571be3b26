"""views: a trace as a terminal timeline and as a Perfetto (Chrome trace) export.

Plain data in, plain data out (rendering lives in cli/): imports no other stage.
"""
