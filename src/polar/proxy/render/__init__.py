"""The gateway's token work: the model's chat template and the ids around it.

Prompts: :mod:`.template` applies the chat template (:mod:`.compiled` renders it
as ``apply_chat_template`` does, faster; :mod:`.toolprompt` gives tools to
templates that have no place for them) and :mod:`.splice` keeps a session's
prompts append-only by splicing earlier turns' sampled ids back in;
:mod:`.tokenbound` bounds a text's token count without tokenizing it.

Replies: :mod:`.tokens` decodes sampled ids to exact text incrementally,
:mod:`.parse` turns that text into an assistant message (reasoning, text, tool
calls) and :mod:`.delivery` derives what the client receives from the sampled
ids in engine-rendered capture.
"""
