"""How private a release is: the dχ mechanism (``mechanism``), its nearest-neighbour search, SAP's
contributing tokens (``cti``), the inversion attack the mechanism measures itself with, the shipped
attack table and the one weak-privacy rule (``rule``); the kinds of token (public frequency band,
personal data: ``kinds``, ``personal_data``) and an attacker's recovery per kind
(``kind_recovery``)."""
