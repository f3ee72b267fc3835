"""UpdateMetadata (api key 6): the controller's push of cluster metadata to every broker.

One package per version, as in kio: ``v7`` holds a ``request`` and a ``response`` module.
"""
