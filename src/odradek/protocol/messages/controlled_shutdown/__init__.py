"""ControlledShutdown (api key 7): a broker's request to the controller before a clean shutdown.

One package per version, as in kio: ``v3`` holds a ``request`` and a ``response`` module.
"""
