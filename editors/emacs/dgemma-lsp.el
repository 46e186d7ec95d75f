;;; dgemma-lsp.el --- DiffusionGemma code infill through lsp-mode  -*- lexical-binding: t; -*-

;; Registers `dgemma-lsp --stdio' with lsp-mode (10 or later) as an add-on server, so it runs
;; beside a language's usual server. What it brings:
;;   - inline completions: `lsp-inline-completion-display' (or `lsp-inline-completion-mode'
;;     to ask after each pause), accept with `lsp-inline-completion-accept';
;;   - the "Rewrite selection (DiffusionGemma)" code action: select code, `lsp-execute-code-action'.
;;
;; Setup:
;;   (add-to-list 'load-path "/path/to/dgemma-lsp/editors/emacs")
;;   (require 'dgemma-lsp)
;;   (add-hook 'python-mode-hook #'lsp)
;;
;; Thin on purpose: the settings go to the server as `initializationOptions' (the names are
;; the server's, see README.md "Settings"); nothing here knows the model.

;;; Code:

(require 'lsp-mode)

(defgroup dgemma-lsp nil
  "DiffusionGemma code infill through lsp-mode."
  :group 'lsp-mode
  :prefix "dgemma-lsp-")

(defcustom dgemma-lsp-command '("dgemma-lsp" "--stdio")
  "The command that starts the language server, as a list of strings."
  :type '(repeat string))

(defcustom dgemma-lsp-settings nil
  "Server settings sent as initializationOptions: a plist such as (:steps 8 :maxTokens 64).
Nil leaves every setting at the server's default."
  :type 'plist)

(defcustom dgemma-lsp-major-modes
  '(python-mode python-ts-mode js-mode js-ts-mode typescript-mode typescript-ts-mode
    go-mode go-ts-mode rust-mode rust-ts-mode c-mode c-ts-mode c++-mode c++-ts-mode
    java-mode java-ts-mode lua-mode lua-ts-mode
    csharp-mode csharp-ts-mode ruby-mode ruby-ts-mode php-mode kotlin-mode kotlin-ts-mode
    swift-mode sh-mode bash-ts-mode scala-mode scala-ts-mode json-mode js-json-mode json-ts-mode
    yaml-mode yaml-ts-mode conf-toml-mode toml-ts-mode html-mode mhtml-mode html-ts-mode
    css-mode css-ts-mode)
  "Major modes the server is started for."
  :type '(repeat symbol))

(lsp-register-client
 (make-lsp-client
  :new-connection (lsp-stdio-connection (lambda () dgemma-lsp-command))
  :major-modes dgemma-lsp-major-modes
  :add-on? t
  :server-id 'dgemma-lsp
  :initialization-options (lambda () dgemma-lsp-settings)))

(provide 'dgemma-lsp)
;;; dgemma-lsp.el ends here
