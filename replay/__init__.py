"""specreplay.replay: the engines (reference scheduler and runner, variants, the step loop), the
workloads that drive them, and the checker and trace diff that read what they record.

Where it sits: record -> traces -> **replay** -> diff. torch is imported only by the runner and
the model, so importing the checker or the diff stays fast.
"""
