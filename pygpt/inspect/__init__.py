"""Looking inside a model: attention_maps.py computes every attention layer's weights and the
steps between (for any family), attention_picture.py draws them as heatmaps, and
attention_explain.py prints one layer's multi-head attention as a worked example with the
model's numbers. `python -m pygpt.attention` is their command line."""
