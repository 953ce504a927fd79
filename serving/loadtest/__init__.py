"""Load testing and warm-up of an OpenAI-compatible server: vLLM directly, or through the sidecar.

``spec`` (what one step sends and how fast, validated), ``client`` (one measured request),
``prompts`` (what to send: generated text at calibrated token lengths, a mix, a prompts file, a
replay of the sidecar's log archive), ``calibrate`` (prompt lengths in the target's tokens),
``pacing`` (open-loop schedules), ``run`` (one step), ``steps`` (several steps with the engine
timeline and the cold starts beside them), ``prepare`` (command-line options to a plan),
``timeline`` (vLLM's or the sidecar's ``/metrics`` during a run), ``coldstart`` (restarts of the
upstream during a run), ``stats`` (percentiles, the summary of a step), ``capacity`` (the SLO,
capacity and provisioning), ``report`` / ``markdown`` / ``plots`` (the report directory),
``progress`` (a bar or plain lines), ``table`` (the terminal table), ``warmup`` (settle a cold
server), ``ramp`` (progressive warm-up), ``drill`` (the kill drill) and ``errors``.
"""
