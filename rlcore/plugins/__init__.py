"""The plugin machinery: the hooks a plugin implements (``hookspecs``), the one plugin manager
(``manager``), the name tables it fills (``registry``) and what a component declares about its
configuration (``settings``)."""
