"""The HTTP server of an export (`pygpt-serve`): the command (command), the model served and the
server's limits (served: Served, open_export), the FastAPI app over it (app), OpenAI-style
completions and their batching decode worker (completions, batcher), the other families' routes
on a bounded task queue (tasks), what the workers share (workers: their one admission rule, the
decode thread), the request bodies (schemas), the errors as JSON (errors), the connections'
read deadlines and limit (connections), the Host allow-list and API key (access), request ids
and log lines (request_log), GET /metrics (metrics) and the playground page (playground/)."""
