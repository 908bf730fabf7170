"""`exgrpo inspect-buffer`: read a checkpoint's replay buffer and describe it.

report.py  pure statistics of a loaded ExperienceBuffer (a JSON-able dict)
render.py  the rich text view of that dict
plot.py    buffer.png (matplotlib, Agg)
show.py    one question's stored responses, decoded (and scored under the checkpoint's policy)

Nothing here imports torch.distributed or vLLM: the command only reads files of the checkpoint.
(Not named `inspect`: `python exgrpo_cli/cli/main.py` puts exgrpo_cli/ on sys.path, where a folder of
that name would shadow the standard library's inspect module.)
"""
