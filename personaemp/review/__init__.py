"""People check the build: the labelling page, agreement with the judge, Label Studio."""
