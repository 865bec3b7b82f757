"""A local stand-in for OpenRouter: its wire format, billing and failures on 127.0.0.1.

Start it with `python -m kimipipe.standin --port-file port.txt` (see `--help`), or from
Python/pytest with `kimipipe.standin.testing.StandIn`. Modules: `server` (the HTTP app and
every check that can refuse a request), `jobs` (serving one accepted completion, plain or
streamed, with its fault), `wire` (JSON and error responses), `answers` (the deterministic
answer to each request), `providers` (the endpoint table and routing rules), `testing`
(start/stop a stand-in subprocess and talk to its control endpoints).
"""
