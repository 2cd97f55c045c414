"""A run on one engine: the context scenarios see (:mod:`.context`), running one phase
(:mod:`.phases`), the request path (:mod:`.sending`), the references (:mod:`.references`), the
judge (:mod:`.judge`) and the run folder (:mod:`.rundir`)."""
