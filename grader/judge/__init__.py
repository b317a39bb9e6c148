"""TRUSTED: one submission graded, stage by stage: plan -> worker (through the sandbox) ->
verdict -> integrity and timing findings -> scoring -> feedback. Runs outside the sandbox."""
