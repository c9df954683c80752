"""The training data of every family, read from files into batches: a text as tokens for the
GPT (text: the token cache, context windows), sentence pairs with masked tokens for BERT's
pretraining (mlm), labelled texts for classification (labelled), sentence pairs for the
translator (parallel), and what they share (common)."""
