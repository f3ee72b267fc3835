"""StopReplica (api key 5): the controller's instruction to stop, and maybe delete, replicas.

One package per version, as in kio: ``v3`` holds a ``request`` and a ``response`` module.
"""
