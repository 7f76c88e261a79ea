"""What a long-term memory may hold: the trust rules every store policy applies, in each shipped
language (en, zh, es, de, fr, ja). The gateway's deterministic policy keeps the sentences that
pass them; the memory service checks a model's extracted facts against the same rules.

A memory is the user's own words replayed in later sessions, so only what the user states
about themselves is kept: never a question, a request for this run, anything that speaks to or
about the assistant and its instructions, or a claim of authority, approval or permission.
"""

import re
import unicodedata
from dataclasses import dataclass
from typing import Final, Literal

MAX_STATEMENT: Final = 300
"""Characters in a stored statement at most: a fact about oneself fits in a sentence."""

Verdict = Literal[
    "stored",
    "empty",
    "too_long",
    "question",
    "not_about_the_user",
    "request",
    "addresses_the_assistant",
    "claims_authority",
]
"""Why a sentence is or is not remembered; `stored` is the only verdict that keeps it."""


@dataclass(frozen=True)
class Language:
    """One language's patterns, matched against the NFKC-normalised, case-folded sentence
    (apostrophes straightened). Latin-script patterns carry their own word boundaries; CJK
    ones match anywhere, since CJK text has no spaces between words."""

    lead_in: str
    """A conversational opener dropped before judging ("Remember this:", "请记住")."""
    first_person: str
    """How a statement about oneself starts (anchored at the start)."""
    request: str
    """A request for this run rather than a fact ("I want", "我想要", "please")."""
    assistant: str
    """Words that speak to or about the assistant and its instructions."""
    authority: str
    """Claims of rank, approval or permission ("CEO", "pre-approved", "已批准")."""
    question: str = r"[?\uff1f]$"
    """How a question ends (or starts)."""


def _ascii_word(words: str) -> str:
    """`words` as whole words even next to CJK text, where `\\b` sees no boundary."""
    return rf"(?<![a-z])(?:{words})(?![a-z])"


LANGUAGES: Final[dict[str, Language]] = {
    "en": Language(
        lead_in=(
            r"(?:also|and|btw|by the way|fyi|for the record|for your information|oh|ok|okay|so"
            r"|just so you know)\s*[,:]?\s+"
            r"|(?:please\s+)?(?:remember|note|keep in mind|don't forget)"
            r"(?:\s+(?:that|this))?\s*[:,]?\s+"
        ),
        first_person=r"(?:i|i'm|im|i've|i'd|i'll|my|mine|we|we're|we've|our)\b",
        request=(
            r"^(?:i|we)(?:'d| would)? (?:want|need|wish)\b"
            r"|^(?:i|we)(?:'d| would) (?:like|love)\b"
            r"|^(?:i'm|i am|we're|we are) (?:looking for|trying to|asking)\b"
            r"|^(?:i|we) (?:ask|request|order|demand)\b"
            r"|\bplease\b"
        ),
        assistant=(
            r"\b(?:you|your|yours|yourself|assistant|chatbot|bot|prompt|instructions?|ignore|"
            r"disregard|override|jailbreak|pretend|act as|from now on)\b"
        ),
        authority=(
            _ascii_word(
                r"ceo|cto|cfo|coo|president|chairman|chairwoman|admin|administrator|superuser"
                r"|sysadmin|root"
            )
            + r"|\b(?:pre-?approved|approved?|approval|authori[sz]ed|authori[sz]ation|authority"
            r"|permission|permitted|allowed|entitled|clearance|privileged?|privileges"
            r"|exempt(?:ed)?|waived?|unlimited)\b"
        ),
    ),
    "zh": Language(
        lead_in=(
            r"(?:请|請)?(?:记住|記住|记得|記得|记一下|記一下|注意|备注|備註|留意)"
            r"(?:这个|這個|这点|這點|一下)?\s*[:\uff1a,\uff0c]?\s*"
            r"|(?:顺便说一下|順便說一下|顺便|順便|另外|对了|對了|补充一下|補充一下)\s*[,\uff0c:\uff1a]?\s*"
        ),
        first_person=r"(?:我|本人|咱)",
        request=r"^(?:我|我们|我們)(?:想|要|需要|希望|打算|请|請)|请|請|帮我|幫我|给我|給我",
        assistant=(
            r"你|您|助手|机器人|機器人|提示词|提示詞|指令|指示|忽略|无视|無視|系统|系統"
            r"|从现在开始|從現在開始|扮演|规则|規則"
        ),
        authority=(
            r"首席执行官|首席執行官|总裁|總裁|董事长|董事長|老板|老闆|管理员|管理員|批准|授权|授權"
            r"|权限|權限|许可|許可|特权|特權|豁免|免审|免審|无需审批|無需審批|不需要审批"
        ),
        question=r"[?\uff1f]$|[吗嗎呢][。.]?$",
    ),
    "es": Language(
        lead_in=(
            r"(?:por favor,?\s+)?(?:recuerda|recuerde|ten en cuenta|tenga en cuenta|toma nota"
            r"|nota|apunta|no olvides)(?:\s+(?:que|esto|de esto))?\s*[:,]?\s+"
            r"|(?:por cierto|además|para que lo sepas|para tu información)\s*[,:]?\s+"
        ),
        first_person=(
            r"(?:(?:siempre|nunca|no|también|ya)\s+)?(?:yo|mi|mis|me|nosotros|nosotras|nuestro"
            r"|nuestra|nuestros|nuestras|soy|estoy|tengo|vivo|prefiero|trabajo|viajo|uso|odio"
            r"|evito|suelo|llevo|hablo|nací|crecí|somos|estamos|tenemos|vivimos|preferimos"
            r"|viajamos|quiero|quisiera|necesito|busco|queremos|necesitamos)\b"
        ),
        request=(
            r"^(?:(?:yo|no)\s+)?(?:quiero|quisiera|necesito|busco|estoy buscando|queremos"
            r"|necesitamos|buscamos|me gustaría|nos gustaría)\b|\bpor favor\b"
        ),
        assistant=(
            r"\b(?:tú|tu|tus|usted|ti|asistente|bot|prompt|instrucciones|instrucción|ignora"
            r"|ignorar|ignores|olvida tus|a partir de ahora|de ahora en adelante|sistema|reglas)\b"
        ),
        authority=(
            r"\b(?:director general|directora general|ceo|administrador|administradora"
            r"|aprobad[oa]s?|preaprobad[oa]s?|pre-aprobad[oa]s?|autorizad[oa]s?|autorización"
            r"|permiso|permisos|privilegios?|exent[oa]s?)\b"
        ),
        question=r"[?\uff1f]$|^¿",
    ),
    "de": Language(
        lead_in=(
            r"(?:bitte\s+)?(?:merk dir|merke dir|merken sie sich|denk daran|denke daran|beachte"
            r"|hinweis|notiz|zur info|zur kenntnis|vergiss nicht)(?:\s*,?\s*(?:dass|das))?"
            r"\s*[:,]?\s+"
            r"|(?:übrigens|ach ja|nebenbei|fyi)\s*[,:]?\s+"
        ),
        first_person=r"(?:ich|mein|meine|meinen|meinem|meiner|meines|mir|mich|wir|unser|unsere"
        r"|unseren|unserem|unserer|uns)\b",
        request=(
            r"^(?:ich|wir) (?:möchte|möchten|will|wollen|brauche|brauchen|hätte gern|hätten gern"
            r"|suche|suchen|wünsche|bestelle)\b|\bbitte\b"
        ),
        assistant=(
            r"\b(?:du|dein|deine|deinen|deinem|deiner|dich|dir|assistent|assistentin|bot|prompt"
            r"|anweisung|anweisungen|ignorier|ignoriere|ignorieren|ab jetzt|von nun an|system"
            r"|regeln)\b"
        ),
        authority=(
            r"\b(?:geschäftsführer|geschäftsführerin|vorstand|vorstandschef|ceo|administrator"
            r"|administratorin|genehmigt|vorab genehmigt|freigegeben|autorisiert|berechtigt"
            r"|berechtigung|befugnis|befugt|erlaubnis|privileg|privilegien|ausnahmegenehmigung)\b"
        ),
    ),
    "fr": Language(
        lead_in=(
            r"(?:s'il te plaît,?\s+|s'il vous plaît,?\s+)?"
            r"(?:souviens-toi|souvenez-vous|rappelle-toi|retiens|retenez|note|notez|à noter"
            r"|n'oublie pas|n'oubliez pas)"
            r"(?:\s+(?:que|ceci|de ceci|bien))?\s*[:,]?\s+"
            r"|(?:au fait|d'ailleurs|aussi|pour info|pour information|sache que|sachez que)"
            r"\s*[,:]?\s+"
        ),
        first_person=r"(?:j'|(?:je|moi|mon|ma|mes|nous|notre|nos)\b)",
        request=(
            r"^(?:je|nous) (?:veux|voudrais|souhaite|cherche|voulons|voudrions|souhaitons"
            r"|cherchons)\b|^j'(?:aimerais|ai besoin)\b|^nous avons besoin\b"
            r"|s'il (?:te|vous) plaît"
        ),
        assistant=(
            r"\b(?:tu|toi|ton|ta|tes|vous|votre|vos|assistant|assistante|bot|prompt|instructions?"
            r"|ignore|ignorer|ignorez|désormais|à partir de maintenant|système|règles)\b"
        ),
        authority=(
            r"\b(?:pdg|directeur général|directrice générale|ceo|administrateur|administratrice"
            r"|approuvée?s?|pré-approuvée?s?|préapprouvée?s?|autorisée?s?|autorisation|permission"
            r"|habilitée?s?|habilitation|privilèges?|exemptée?s?)\b"
        ),
    ),
    "ja": Language(
        lead_in=(
            r"(?:覚えておいて(?:ください|下さい)?|覚えといて|メモ|注意|備考)\s*[:\uff1a、,\uff0c]?\s*"
            r"|(?:ちなみに|念のため|参考までに|ところで)\s*[、,\uff0c:\uff1a]?\s*"
        ),
        first_person=r"(?:私|わたし|僕|ぼく|俺|自分|うち|我々)",
        request=r"ください|下さい|お願い|してほしい|して欲しい|したい|予約して|探して",
        assistant=(
            r"あなた|アシスタント|ボット|指示|命令|プロンプト|無視|システム|これからは|今後は|ルール"
        ),
        authority=r"社長|最高経営責任者|会長|管理者|承認|事前承認|許可|権限|特権|免除",
        question=r"[?\uff1f]$|か[。.]?$",
    ),
}
"""The shipped languages. A sentence is judged against all of them at once: no language
detection, and a sentence that mixes languages meets every table's exclusions."""


def _union(patterns: list[str], *, anchored: bool = False) -> re.Pattern[str]:
    joined = "|".join(f"(?:{p})" for p in patterns)
    return re.compile(f"^(?:{joined})" if anchored else joined)


_TABLES = list(LANGUAGES.values())
_SENTENCE_END: Final = re.compile(r"(?<=[.!?])\s+|(?<=[。\uff01\uff1f!?])(?=\S)|\n+")
_LEAD_IN: Final = re.compile(
    "^(?:" + "|".join(f"(?:{t.lead_in})" for t in _TABLES) + ")+", re.IGNORECASE
)
_FIRST_PERSON: Final = _union([t.first_person for t in _TABLES], anchored=True)
_REQUEST: Final = _union([t.request for t in _TABLES])
_ASSISTANT: Final = _union([t.assistant for t in _TABLES])
_AUTHORITY: Final = _union([t.authority for t in _TABLES])
_QUESTION: Final = _union([t.question for t in _TABLES])


def fold(text: str) -> str:
    """The form the rules read: NFKC (full-width Latin becomes ASCII), case-folded, typographic
    apostrophes straightened."""
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'").casefold().strip()


def sentences(text: str) -> list[str]:
    """`text` cut after sentence punctuation (`.`, `!`, `?` before a space; the ideographic
    full stop and the full-width `!` and `?` anywhere) and at line breaks, each piece stripped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def without_lead_in(sentence: str) -> str:
    """The sentence after conversational lead-ins ("Remember this: ", "请记住", "Übrigens, ")."""
    return _LEAD_IN.sub("", sentence.strip()).strip()


def verdict(sentence: str) -> Verdict:
    """Whether a sentence (after its lead-in) may be remembered, and why not.

    Kept: a statement in the first person — what the user is, has, prefers, or must stay
    within. Not kept: questions, anything not about the user, requests for this run, anything
    that speaks to or about the assistant and its instructions, and claims of authority,
    approval or permission, because replayed in a later session such a sentence would steer
    the assistant rather than inform it.
    """
    if not sentence.strip():
        return "empty"
    if len(sentence) > MAX_STATEMENT:
        return "too_long"
    folded = fold(sentence)
    if _QUESTION.search(folded):
        return "question"
    if not _FIRST_PERSON.match(folded):
        return "not_about_the_user"
    if _REQUEST.search(folded):
        return "request"
    if _ASSISTANT.search(folded):
        return "addresses_the_assistant"
    if _AUTHORITY.search(folded):
        return "claims_authority"
    return "stored"


def statements(text: str) -> list[str]:
    """The sentences of one user message the rules keep, without their lead-ins, in order."""
    kept = []
    for sentence in sentences(text):
        statement = without_lead_in(sentence)
        if verdict(statement) == "stored":
            kept.append(statement)
    return kept
