;;; scenarios.el --- lsp-mode 10 driving dgemma-lsp, headless  -*- lexical-binding: t; -*-

;; Run by tests/editors/test_emacs.py as `emacs --batch -Q -l scenarios.el' in a scratch project
;; holding sample.py. Environment: DGEMMA_EMACS_ELPA (lsp-mode and its dependencies, one folder
;; each), DGEMMA_EMACS_CMD and DGEMMA_EMACS_SETTINGS (JSON), DGEMMA_EMACS_STATE (lsp-mode's own
;; files), DGEMMA_EMACS_TIMEOUT_S. The scenarios are what a user does: ask for an inline
;; completion and accept it; select code and run "Rewrite selection". Prints PASS on success;
;; any failure is an error, which makes Emacs exit non-zero.

;;; Code:

;; A first start would otherwise natively compile lsp-mode in the background on every core.
(setq native-comp-deferred-compilation nil)
(dolist (dir (directory-files (getenv "DGEMMA_EMACS_ELPA") t "\\`[a-z]"))
  (add-to-list 'load-path dir))
(add-to-list 'load-path (expand-file-name "../" (file-name-directory load-file-name)))

(defvar dgemma-test-deadline
  (+ (float-time) (string-to-number (or (getenv "DGEMMA_EMACS_TIMEOUT_S") "240"))))

(setq lsp-session-file (expand-file-name "lsp-session" (getenv "DGEMMA_EMACS_STATE"))
      lsp-server-install-dir (expand-file-name "servers" (getenv "DGEMMA_EMACS_STATE"))
      lsp-response-timeout 180          ; the first request may wait for the model to load
      lsp-enable-file-watchers nil
      lsp-keep-workspace-alive nil
      lsp-restart 'ignore
      lsp-enable-snippet nil
      lsp-lens-enable nil               ; features this server does not offer: nothing to load
      lsp-headerline-breadcrumb-enable nil
      lsp-modeline-code-actions-enable nil
      lsp-modeline-diagnostics-enable nil
      lsp-auto-guess-root t)

(require 'json)
(require 'dgemma-lsp)
(require 'lsp-inline-completion)

(setq dgemma-lsp-command (json-parse-string (getenv "DGEMMA_EMACS_CMD") :array-type 'list)
      dgemma-lsp-settings (json-parse-string (getenv "DGEMMA_EMACS_SETTINGS") :object-type 'plist
                                             :false-object :json-false :null-object nil)
      lsp-enabled-clients '(dgemma-lsp))

(defun dgemma-test-say (format-string &rest args)
  (princ (concat (apply #'format format-string args) "\n")))

(defun dgemma-test-check (ok what)
  (unless ok (error "FAIL: %s" what))
  (dgemma-test-say "ok: %s" what))

(defun dgemma-test-wait (predicate what)
  "Process the server's output until PREDICATE holds (an error at the deadline)."
  (while (not (funcall predicate))
    (when (> (float-time) dgemma-test-deadline)
      (error "FAIL: timed out waiting for %s" what))
    (accept-process-output nil 0.05)))

(defun dgemma-test-rest-of (text from)
  "TEXT from buffer position FROM on (positions are 1-based)."
  (substring text (1- from)))

;; -- start: open a file of the project, lsp-mode starts and initializes the server ----------

(let ((project (file-name-as-directory default-directory)))
  (lsp-workspace-folders-add project)
  (find-file (expand-file-name "sample.py" project)))
(lsp)
(dgemma-test-wait (lambda () (and (lsp-workspaces)
                                  (eq (lsp--workspace-status (car (lsp-workspaces))) 'initialized)))
                  "the server to initialize")
(dgemma-test-check (lsp-feature? "textDocument/inlineCompletion") "the server offers inline completion")

;; -- inline completion: typed code, a suggestion is shown at the cursor, accept inserts it ---

(goto-char (point-max))
(insert "\n\ndef area(radius):\n    return ")
(let* ((before (buffer-string))
       (cursor (point))
       (started (float-time)))
  (lsp-inline-completion-display)
  (dgemma-test-check (lsp-inline-completion--active-p) "an inline suggestion is shown")
  (let ((shown (overlay-get lsp-inline-completion--overlay 'after-string)))
    (dgemma-test-check (> (length shown) 0) (format "the suggestion has text: %S" shown)))
  (dgemma-test-say "inline suggestion in %.1f s" (- (float-time) started))
  (lsp-inline-completion-accept)
  (let ((after (buffer-string)))
    (dgemma-test-check (> (length after) (length before)) "accepting inserts the suggestion")
    (dgemma-test-check (string-prefix-p (substring before 0 (1- cursor)) after)
                       "the text before the cursor is kept")
    (dgemma-test-check (string-suffix-p (dgemma-test-rest-of before cursor) after)
                       "the text after the cursor is kept")
    (dgemma-test-say "accepted: %S" (substring after (1- cursor) (- (length after)
                                                                    (length (dgemma-test-rest-of before cursor)))))))

;; -- rewrite: select a line, the code action replaces exactly the selection ------------------

(transient-mark-mode 1)
(goto-char (point-min))
(search-forward "return \"hello \" + name")
(let ((start (line-beginning-position))
      (end (line-end-position))
      (before (buffer-string)))
  (set-mark start)
  (goto-char end)
  (activate-mark)
  (let* ((actions (lsp-code-actions-at-point))
         (rewrite (seq-find (lambda (action) (string-match-p "Rewrite selection" (lsp:code-action-title action)))
                            actions)))
    (dgemma-test-check rewrite "the rewrite action is offered for the selection")
    (lsp-execute-code-action rewrite))
  (dgemma-test-wait (lambda () (not (equal (buffer-string) before))) "the rewrite edit")
  (let ((after (buffer-string)))
    (dgemma-test-check (string-prefix-p (substring before 0 (1- start)) after) "the text before the selection is kept")
    (dgemma-test-check (string-suffix-p (dgemma-test-rest-of before end) after) "the text after the selection is kept")))

(dgemma-test-say "PASS")
(let ((lsp-keep-workspace-alive nil))
  (lsp-workspace-shutdown (car (lsp-workspaces))))
;;; scenarios.el ends here
