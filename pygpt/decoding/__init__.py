"""From a model's outputs to tokens and text: sampling and the generation loop of a decoder
(sampling), beam search for the translator (beam_search, whose bookkeeping is the torch-free
runtime's), batched translation of texts (translate_texts), and the check that outputs are finite
numbers before anything is chosen from them (finite)."""
