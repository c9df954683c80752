"""The HTTP server of an export (`pygpt-serve`): the command (command), the FastAPI app over a
served model (app), OpenAI-style completions and their batching decode worker (completions,
batcher), the other families' routes on a bounded task queue (tasks), the request bodies
(schemas), the errors as JSON (errors) and the playground page (playground/)."""
