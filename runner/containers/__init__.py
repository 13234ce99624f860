"""Containers on this machine, for Harbor tasks: `runtime` runs podman (or docker) with the flags these machines
need, `images` builds each task's environment/ into an image named by its content, `verifier` judges a session
by Harbor's verifier contract in a container of the task's image. A package of its own, beside the session
program: these modules know nothing of sessions, and the session program plugs them in as its container place."""
