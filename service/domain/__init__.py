"""Use cases: ingest, planning, jobs, feedback, MoE, parallel layouts. Calls partitioners; never commits."""
