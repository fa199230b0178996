"""The user-side client (``client``): privatizes locally and talks to the provider service."""
