"""observers: what watches any vLLM-shaped scheduler and runner and writes trace rows.

Holds the observer, the KV ground truth, and the recorder's columns; the SGLang observer and
its KV truth. Imports models' messages and the traces package; never an implementation class.
"""
