"""A run on one engine: the context scenarios see (:mod:`.context`), the references
(:mod:`.references`), the judge (:mod:`.judge`) and the run folder (:mod:`.rundir`)."""
