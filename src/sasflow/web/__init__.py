"""The operator surface over HTTP (SPEC U4), served by `sasflow serve`: the JSON API
under /api/v1 with its OpenAPI document (app.py, api.py), who may call it (auth.py,
session.py), and how it fails (errors.py). Needs the `web` extra."""
