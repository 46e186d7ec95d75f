"""Next-edit suggestions, the parts that need no model: which edits the user made, which window
the model may rewrite, and which single edit of its answer is proposed.

- edits.py: the recent-edit log of one document (keystrokes merged into edits, unified diffs
  for the prompt, the last edit for the revert filter);
- window.py: the edit window, a syntax-bounded block of whole lines around the cursor and the
  last edit;
- proposal.py: the answer diffed against the window, the hunk nearest the last edit, "no edit",
  and the filters (reverts of the last edit, rejected edits);
- request.py: the DenoiseRequest of one next edit (the window renoised as a rewrite, the diffs in
  the prompt) and the proposal made from its answer.

Knows tree-sitter (through engine/syntax) and difflib; knows no torch and no LSP.
"""
