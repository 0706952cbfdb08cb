"""Sans-IO implementation of the git upload-pack wire protocol (v0, v1 and v2).

Nothing here performs I/O: functions take bytes or typed values and return bytes, typed
values or decisions. Repository facts arrive as arguments or through small Protocols.
"""

from .advertise import format_service_header, format_v0_capabilities, iter_v0_advertisement
from .bundle_uri import check_bundle_uri_args, iter_bundle_list
from .capabilities import V2Features, iter_v2_capabilities
from .command import CommandRequest, parse_command_request
from .errors import ClientError, ProtocolError, Refusal
from .fetch_request import (
    INFINITE_DEPTH,
    FetchRequest,
    HavesEnd,
    MultiAck,
    Sideband,
    parse_v0_request,
    parse_v2_fetch_args,
)
from .filters import FilterSpec, parse_filter_spec
from .ls_refs import LsRefsRequest, iter_ls_refs, parse_ls_refs_args
from .negotiate import HaveOracle, V0Answer, V2Answer, negotiate_v0, negotiate_v2
from .object_info import ObjectInfoRequest, iter_object_info, parse_object_info_args
from .pktline import (
    DELIM_PKT,
    FLUSH_PKT,
    NEED_MORE,
    Pkt,
    PktBuffer,
    PktKind,
    decode_pkt,
    encode_pkt,
    iter_pkts,
)
from .refs import HeadInfo, Ref, ref_is_hidden

__all__ = [
    "check_bundle_uri_args",
    "iter_bundle_list",
    "ClientError",
    "ProtocolError",
    "Refusal",
    "CommandRequest",
    "parse_command_request",
    "FetchRequest",
    "HavesEnd",
    "MultiAck",
    "Sideband",
    "INFINITE_DEPTH",
    "parse_v0_request",
    "parse_v2_fetch_args",
    "FilterSpec",
    "parse_filter_spec",
    "LsRefsRequest",
    "iter_ls_refs",
    "parse_ls_refs_args",
    "HaveOracle",
    "V0Answer",
    "V2Answer",
    "negotiate_v0",
    "negotiate_v2",
    "ObjectInfoRequest",
    "iter_object_info",
    "parse_object_info_args",
    "Pkt",
    "PktBuffer",
    "PktKind",
    "NEED_MORE",
    "FLUSH_PKT",
    "DELIM_PKT",
    "decode_pkt",
    "encode_pkt",
    "iter_pkts",
    "HeadInfo",
    "Ref",
    "ref_is_hidden",
    "format_service_header",
    "format_v0_capabilities",
    "iter_v0_advertisement",
    "V2Features",
    "iter_v2_capabilities",
]
