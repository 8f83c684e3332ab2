"""An nbgrader preprocessor that caps the characters of each output (nbgrader's LimitOutput caps lines:
one print of five megabytes is a single line). Keeps the start and the end of a long output."""
from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer

from lab_src.harness import limits


class LimitOutputChars(NbGraderPreprocessor):
    max_chars = Integer(limits.OUTPUT_MAX_CHARS, help="characters kept of each output").tag(config=True)

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        head, tail = self.max_chars * 4 // 5, self.max_chars // 5
        return f"{text[:head]}\n[... {len(text) - head - tail} characters cut by the grader ...]\n{text[-tail:]}"

    def preprocess_cell(self, cell, resources, cell_index):
        for out in cell.get("outputs", []):
            if "text" in out and isinstance(out["text"], str):
                out["text"] = self._cut(out["text"])
            data = out.get("data", {})
            if isinstance(data.get("text/plain"), str):
                data["text/plain"] = self._cut(data["text/plain"])
        return cell, resources
