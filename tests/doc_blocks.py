"""The fenced blocks of a page of the docs, which the doc tests run and check."""

import re
from typing import List, Tuple

_FENCED = re.compile(r'^```(\w+)\n(.*?)^```', re.MULTILINE | re.DOTALL)


def Blocks(text: str) -> List[Tuple[str, str]]:
  """(language, code) of each fenced block of `text`, in order."""
  return _FENCED.findall(text)


def Code(text: str, language: str) -> List[str]:
  """The code of each fenced block of `text` in `language`, in order."""
  return [code for lang, code in Blocks(text) if lang == language]
