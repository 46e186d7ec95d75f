"""The resident engine daemon: one loaded model shared by every editor window of a user.

`host` is the daemon process (serves many clients, one job at a time),
`protocol` its length-prefixed msgpack frames, `paths` where its socket, token
and lock live, and `client` the language server's side of the connection (an
`EngineClient` that spawns the daemon when absent). No torch here but in the
host, lazily, when it loads the model.
"""
