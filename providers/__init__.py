"""Cloud providers behind one small async Protocol (:mod:`providers.base`)."""
