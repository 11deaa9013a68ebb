"""A fine-tuned (Distil)BERT sequence classifier from a local directory, as Mico uses.

Optional: needs `transformers` and `torch`, which wattwise does not require. The
directory holds a model fine-tuned with one label per length bucket (Mico §4.1.1:
AdamW, lr 5e-5); online updates take one AdamW step per sampled batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class TransformerBucketModel:
    def __init__(self, path: str | Path, n_buckets: int, learning_rate: float = 5e-5, max_length: int = 256) -> None:
        try:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError as exc:
            raise ImportError("predictor kind 'transformer' needs `pip install transformers torch`") from exc
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
        if self.model.config.num_labels != n_buckets:
            raise ValueError(f"{path}: model has {self.model.config.num_labels} labels, the buckets are {n_buckets}")
        self.max_length = max_length
        self._optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate)

    def _encode(self, texts: list[str]):
        return self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")

    def predict_proba(self, texts: list[str], prompt_tokens: list[int]) -> np.ndarray:
        with self._torch.no_grad():
            logits = self.model(**self._encode(texts)).logits
        return self._torch.softmax(logits, dim=-1).numpy()

    def partial_fit(self, texts: list[str], prompt_tokens: list[int], labels: list[int]) -> None:
        self.model.train()
        loss = self.model(**self._encode(texts), labels=self._torch.tensor(labels)).loss
        loss.backward()
        self._optimizer.step()
        self._optimizer.zero_grad()
        self.model.eval()
