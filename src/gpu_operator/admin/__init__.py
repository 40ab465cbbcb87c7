"""gpu_operator.admin: the commands a person (or the chart's pre-delete hook) runs against a
cluster: `upgrade`, `cleanup`, `must-gather`, and the redaction must-gather uses. Not run by the
operator; registered from the top CLI."""
