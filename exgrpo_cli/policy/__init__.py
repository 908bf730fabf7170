"""The policy: model loading, the optimizer with its skip rule, checkpoints.

Where it sits in the step: the forward/backward of the loss and the optimizer step, and the
checkpoint written at the end of a step.
"""
