"""What the page lets in before Chainlit sees it: which web origins may use it (``origins``) and what
each socket event must carry (``socket_checks``)."""
